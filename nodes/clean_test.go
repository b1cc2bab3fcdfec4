package nodes

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	tests := []struct {
		name, in, want, reasoning string
	}{
		{"plain", "a castle on a hill", "a castle on a hill", ""},
		{"white space", " \n\ta castle\r\n ", "a castle", ""},
		{"think block", "<think>hmm</think>a castle", "a castle", "hmm"},
		{"think block upper case", "<THINK>\nplan\n</THINK>\n\na castle", "a castle", "plan"},
		{"thinking tag", "<thinking>x</thinking> a castle", "a castle", "x"},
		{"two think blocks", "<think>a</think>a castle<think>b</think>", "a castle", "a\n\nb"},
		{"block between words keeps them apart", "red<think>x</think>castle", "red castle", "x"},
		{"unterminated think at the start", "<think>I should describe the", "", "I should describe the"},
		{"unterminated think after the prompt", "a castle\n<think>wait", "a castle", "wait"},
		{"closing tag only", "the template opened it\n</think>\n\na castle", "a castle", "the template opened it"},
		{"think block then label and quotes", "<think>hmm</think>**Prompt:** \"a castle\"", "a castle", "hmm"},
		{"ollama cli thinking", "Thinking...\nthe user wants a castle\n...done thinking.\n\na castle", "a castle", "the user wants a castle"},
		{"ollama cli thinking, CRLF", "Thinking...\r\nplan\r\n...done thinking.\r\n\r\na castle", "a castle", "plan"},
		{"ollama cli thinking unterminated", "Thinking...\nstill going", "", "still going"},
		{"label", "Prompt: a castle", "a castle", ""},
		{"bold label", "**Prompt:** a castle", "a castle", ""},
		{"bold label, colon outside", "**Prompt**: a castle", "a castle", ""},
		{"bold around everything", "**Prompt: a castle**", "a castle", ""},
		{"enhanced prompt label", "Enhanced prompt: a castle", "a castle", ""},
		{"enhanced prompt label, lower case", "enhanced PROMPT : a castle", "a castle", ""},
		{"heading label", "## Refined Prompt\n\na castle", "a castle", ""},
		{"bold heading line", "**Final Prompt**\na castle", "a castle", ""},
		{"preamble", "Sure! Here is your detailed prompt:\n\n\"a castle\"", "a castle", ""},
		{"negative label", "Negative prompt: blurry, lowres", "blurry, lowres", ""},
		{"label then quotes then label", "Prompt: \"Prompt: a castle\"", "a castle", ""},
		{"straight quotes", `"a castle"`, "a castle", ""},
		{"single quotes", `'a castle'`, "a castle", ""},
		{"single quotes around an apostrophe", `'a knight's castle'`, "a knight's castle", ""},
		{"curly quotes", "“a castle”", "a castle", ""},
		{"curly single quotes with apostrophe", "‘a knight’s castle’", "a knight’s castle", ""},
		{"guillemets", "«a castle»", "a castle", ""},
		{"nested quotes", "\"'a castle'\"", "a castle", ""},
		{"code fence", "```text\na castle\n```", "a castle", ""},
		{"inner quotes kept", `"a castle" and "a moat"`, `"a castle" and "a moat"`, ""},
		{"quoted word inside kept", `a sign reading "open"`, `a sign reading "open"`, ""},
		{"label inside text kept", "a castle. Prompt: none", "a castle. Prompt: none", ""},
		{"prompt word without colon kept", "Prompt engineering poster, bold type", "Prompt engineering poster, bold type", ""},
		{"negative space kept", "Negative space dominates, a lone tree", "Negative space dominates, a lone tree", ""},
		{"empty", "", "", ""},
		{"only reasoning", "<think>nothing to say</think>", "", "nothing to say"},
		{"only quotes", `""`, "", ""},
		{"invalid UTF-8", "a \xffcastle", "a \uFFFDcastle", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reasoning := Clean(tt.in, CleanOptions{})
			if got != tt.want || reasoning != tt.reasoning {
				t.Errorf("Clean(%q) = %q, %q; want %q, %q", tt.in, got, reasoning, tt.want, tt.reasoning)
			}
			if again, _ := Clean(got, CleanOptions{}); again != got {
				t.Errorf("not idempotent: Clean(%q) = %q", got, again)
			}
		})
	}
}

func TestCleanOptions(t *testing.T) {
	const in = "<think>hmm</think>\n**Prompt:** \"a castle\""
	tests := []struct {
		name      string
		opts      CleanOptions
		want      string
		reasoning string
	}{
		{"zero value cleans everything", CleanOptions{}, "a castle", "hmm"},
		{"keep reasoning", CleanOptions{KeepReasoning: true}, "<think>hmm</think>\n**Prompt:** \"a castle\"", ""},
		{"keep labels", CleanOptions{KeepLabels: true}, "**Prompt:** \"a castle\"", "hmm"},
		{"keep quotes", CleanOptions{KeepQuotes: true}, "\"a castle\"", "hmm"},
		{"keep all", CleanOptions{KeepReasoning: true, KeepLabels: true, KeepQuotes: true}, in, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reasoning := Clean(in, tt.opts)
			if got != tt.want || reasoning != tt.reasoning {
				t.Errorf("got %q, %q; want %q, %q", got, reasoning, tt.want, tt.reasoning)
			}
		})
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{
		"a castle",
		"<think>hmm</think>**Prompt:** \"a castle\"",
		"<think>unterminated",
		"x</think>y",
		"Thinking...\nplan\n...done thinking.\n\n“a castle”",
		"## Enhanced Prompt\n\n'a knight's castle'",
		"```\na castle\n```",
		"Prompt: \"Prompt: 'a castle'\"",
		"Here's the prompt: **a castle**",
		"**Prompt: a castle**",
		"red<think>x</think>castle",
		"\"\"",
		"a \xffcastle",
	} {
		f.Add(s, false, false, false)
	}
	f.Fuzz(func(t *testing.T, s string, keepReasoning, keepLabels, keepQuotes bool) {
		opts := CleanOptions{KeepReasoning: keepReasoning, KeepLabels: keepLabels, KeepQuotes: keepQuotes}
		got, reasoning := Clean(s, opts)
		if again, _ := Clean(got, opts); again != got {
			t.Fatalf("not idempotent:\nClean(%q)\n= %q\nClean of that = %q", s, got, again)
		}
		if !utf8.ValidString(got) || !utf8.ValidString(reasoning) {
			t.Fatalf("invalid UTF-8 out: %q, %q", got, reasoning)
		}
		if got != strings.TrimSpace(got) {
			t.Fatalf("untrimmed: %q", got)
		}
		if utf8.ValidString(s) && len(got) > len(s) {
			t.Fatalf("output %q longer than input %q", got, s)
		}
	})
}

// BenchmarkCleanWrapped measures Clean on replies wrapped thousands of
// times (labels, label lines, code fences, nested quotes): each wrapper
// costs a step on the ends of the text, not a pass over all of it. Before
// the wrappers got their own loop, "label lines" took 4.4 s and "fences"
// 1.4 s per call here; the fuzzer met such inputs as timeouts.
func BenchmarkCleanWrapped(b *testing.B) {
	cases := []struct{ name, in string }{
		{"labels", strings.Repeat("Prompt: ", 5000) + "x"},
		{"label lines", strings.Repeat("## Prompt\n", 5000) + "x"},
		{"fences", strings.Repeat("```\n", 3000) + "x" + strings.Repeat("\n```", 3000)},
		{"nested curly quotes", strings.Repeat("“", 5000) + "x" + strings.Repeat("”", 5000)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got, _ := Clean(c.in, CleanOptions{}); got != "x" {
					b.Fatalf("Clean = %.40q", got)
				}
			}
		})
	}
}
