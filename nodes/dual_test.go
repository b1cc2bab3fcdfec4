package nodes

import (
	"testing"
	"unicode/utf8"
)

func TestParseDualStream(t *testing.T) {
	tests := []struct {
		name, in, pos, neg string
	}{
		{"plain", "Positive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"lower case", "positive: a castle\nnegative: blurry", "a castle", "blurry"},
		{"upper case", "POSITIVE: a castle\nNEGATIVE: blurry", "a castle", "blurry"},
		{"bold labels", "**Positive:** a castle\n**Negative:** blurry", "a castle", "blurry"},
		{"bold prompt labels, colon outside", "**Positive Prompt**: a castle\n**Negative Prompt**: blurry", "a castle", "blurry"},
		{"bold negative prompt label", "Positive: a castle\n**Negative Prompt:** blurry, lowres", "a castle", "blurry, lowres"},
		{"headings", "## Positive Prompt\na castle\n\n## Negative Prompt\nblurry", "a castle", "blurry"},
		{"headings with colons", "### Positive:\na castle\n### Negative:\nblurry", "a castle", "blurry"},
		{"list items", "- Positive: a castle\n- Negative: blurry", "a castle", "blurry"},
		{"numbered", "1. Positive: a castle\n2. Negative: blurry", "a castle", "blurry"},
		{"quoted sections", "Positive: \"a castle\"\nNegative: \"blurry\"", "a castle", "blurry"},
		{"multi-line sections", "Positive:\na castle,\nat dusk\n\nNegative:\nblurry,\nlowres", "a castle,\nat dusk", "blurry,\nlowres"},
		{"negative first", "Negative: blurry\nPositive: a castle", "a castle", "blurry"},
		{"preamble dropped", "Here are your prompts:\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"reasoning dropped", "<think>Positive: no\nNegative: no</think>\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"negative space inside positive", "Positive: a castle,\nnegative space above the towers\nNegative: blurry", "a castle,\nnegative space above the towers", "blurry"},
		{"negative space at the start", "Negative space frames a castle", "Negative space frames a castle", ""},
		{"label words mid-line", "Positive: a castle with a Negative: sign\nNegative: blurry", "a castle with a Negative: sign", "blurry"},
		{"same line", "Positive: a castle Negative: blurry", "a castle Negative: blurry", ""},
		{"missing negative", "Positive: a castle", "a castle", ""},
		{"empty negative", "Positive: a castle\nNegative:", "a castle", ""},
		{"missing positive label", "a castle\nNegative: blurry", "a castle", "blurry"},
		{"no labels", "a castle at dusk", "a castle at dusk", ""},
		{"no labels, cleaned", "**Prompt:** \"a castle\"", "a castle", ""},
		{"repeated labels, first empty", "Positive:\nNegative:\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"repeated labels, first wins", "Positive: a castle\nNegative: blurry\nPositive: a tower", "a castle", "blurry"},
		{"CRLF", "Positive: a castle\r\nNegative: blurry\r\n", "a castle", "blurry"},
		{"blank", "  \n", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pos, neg := ParseDualStream(tt.in)
			if pos != tt.pos || neg != tt.neg {
				t.Errorf("ParseDualStream(%q)\n= %q, %q\nwant %q, %q", tt.in, pos, neg, tt.pos, tt.neg)
			}
		})
	}
}

func FuzzParseDualStream(f *testing.F) {
	for _, s := range []string{
		"Positive: a castle\nNegative: blurry",
		"**Positive:** a castle\n**Negative Prompt:** blurry",
		"## Positive\na castle\n## Negative\nblurry",
		"Negative: blurry\nPositive: a castle",
		"Positive: a castle,\nnegative space\nNegative: blurry",
		"<think>Positive: x</think>Positive: a\nNegative: b",
		"Positive: \"\"\nNegative: ''",
		"Positive:\nNegative:",
		"a castle",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pos, neg := ParseDualStream(s)
		for _, p := range []string{pos, neg} {
			if utf8.ValidString(s) && !utf8.ValidString(p) {
				t.Fatalf("invalid UTF-8 out of valid input: %q", p)
			}
			if again, _ := Clean(p, CleanOptions{}); again != p {
				t.Fatalf("part %q is not clean: %q", p, again)
			}
		}
		// When both labels are present at line starts, a kind's output is
		// empty only if every section under a label of that kind is blank
		// once cleaned; so both are empty only if the text after both
		// labels is.
		body, _ := Clean(s, CleanOptions{KeepLabels: true, KeepQuotes: true})
		labels := dualLabels(body)
		var sawPos, sawNeg, posText, negText bool
		for i, l := range labels {
			end := len(body)
			if i+1 < len(labels) {
				end = labels[i+1].start
			}
			section, _ := Clean(body[l.end:end], CleanOptions{})
			if l.negative {
				sawNeg, negText = true, negText || section != ""
			} else {
				sawPos, posText = true, posText || section != ""
			}
		}
		if !sawPos || !sawNeg {
			return
		}
		if (pos == "") == posText || (neg == "") == negText {
			t.Fatalf("ParseDualStream(%q) = %q, %q; sections: positive %v, negative %v", s, pos, neg, posText, negText)
		}
	})
}
