package nodes

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CleanOptions choose what Clean leaves in place. The zero value cleans
// everything.
type CleanOptions struct {
	// KeepReasoning leaves reasoning blocks in the text; Clean then
	// returns no reasoning.
	KeepReasoning bool
	// KeepLabels leaves a leading label such as "**Prompt:**",
	// "Enhanced prompt:", "## Prompt" or "Here is your prompt:".
	KeepLabels bool
	// KeepQuotes leaves surrounding quotes (straight, curly, guillemets,
	// backticks), code fences and bold markers.
	KeepQuotes bool
}

// Clean returns the prompt in an LLM's reply, and the reasoning it removed.
//
// Reasoning is a <think>…</think> (or <thinking>, <reasoning>) block, an
// unterminated opening tag and everything after it, a closing tag with no
// opening one and everything before it (templates that open the block in
// the prompt), and Ollama CLI's "Thinking..." … "...done thinking." block,
// likewise. Then a leading label, surrounding quotes and white space go,
// repeatedly, until nothing changes, so Clean(Clean(x)) == Clean(x).
// Invalid UTF-8 is replaced with U+FFFD; the result is valid UTF-8.
// Ollama's separate thinking text (Generation.Thinking) is not part of the
// reply: the nodes add it to Result.Reasoning themselves.
func Clean(text string, opts CleanOptions) (clean, reasoning string) {
	text = strings.ToValidUTF8(text, "\uFFFD")
	var rs []string
	for {
		next := text
		if !opts.KeepReasoning {
			next = stripReasoning(next, &rs)
		}
		next = stripWrappers(strings.TrimSpace(next), opts)
		if next == text {
			break
		}
		text = next
	}
	return text, strings.Join(rs, "\n\n")
}

// stripWrappers removes leading labels and surrounding quotes until none is
// left. Its steps work on the ends of s and slice it without copying, so a
// reply wrapped a thousand times costs a thousand cheap steps, not a
// thousand passes over the whole text; Clean's outer loop then looks for
// reasoning again only when something changed.
func stripWrappers(s string, opts CleanOptions) string {
	for {
		next := s
		if !opts.KeepLabels {
			next = strings.TrimSpace(stripLabel(next))
		}
		if !opts.KeepQuotes {
			next = strings.TrimSpace(stripQuotes(next))
		}
		if next == s {
			return s
		}
		s = next
	}
}

var (
	// A closed reasoning block. RE2 has no back references, so any of
	// the tag names closes any other.
	thinkBlockRe = regexp.MustCompile(`(?is)<(?:think|thinking|reasoning)>(.*?)</(?:think|thinking|reasoning)>`)
	thinkOpenRe  = regexp.MustCompile(`(?i)<(?:think|thinking|reasoning)>`)
	thinkCloseRe = regexp.MustCompile(`(?i)</(?:think|thinking|reasoning)>`)
	// Ollama CLI's rendering of a thinking model's reasoning.
	cliBlockRe = regexp.MustCompile(`(?ims)^[ \t]*thinking\.\.\.[ \t]*\r?$(.*?)^[ \t]*\.\.\.done thinking\.?[ \t]*\r?$`)
	cliOpenRe  = regexp.MustCompile(`(?im)^[ \t]*thinking\.\.\.[ \t]*\r?$`)
	cliCloseRe = regexp.MustCompile(`(?im)^[ \t]*\.\.\.done thinking\.?[ \t]*\r?$`)
)

// stripReasoning removes reasoning from s, appending it to rs.
func stripReasoning(s string, rs *[]string) string {
	for _, f := range []struct{ block, open, close *regexp.Regexp }{
		{thinkBlockRe, thinkOpenRe, thinkCloseRe},
		{cliBlockRe, cliOpenRe, cliCloseRe},
	} {
		s = cutBlocks(s, f.block, rs)
		// A closing marker with no opening one: the template opened the
		// block, so everything before it is reasoning.
		if loc := f.close.FindStringIndex(s); loc != nil {
			addReasoning(rs, s[:loc[0]])
			s = s[loc[1]:]
		}
		// An opening marker never closed: the reply was cut while
		// thinking, so everything after it is reasoning.
		if loc := f.open.FindStringIndex(s); loc != nil {
			addReasoning(rs, s[loc[1]:])
			s = s[:loc[0]]
		}
	}
	return s
}

// cutBlocks removes every match of re, keeping submatch 1 as reasoning. A
// block between two words leaves a space so that they stay apart.
func cutBlocks(s string, re *regexp.Regexp, rs *[]string) string {
	locs := re.FindAllStringSubmatchIndex(s, -1)
	if locs == nil {
		return s
	}
	var b strings.Builder
	last := 0
	for _, l := range locs {
		b.WriteString(s[last:l[0]])
		addReasoning(rs, s[l[2]:l[3]])
		before, _ := utf8.DecodeLastRuneInString(s[:l[0]])
		after, _ := utf8.DecodeRuneInString(s[l[1]:])
		if l[0] > 0 && l[1] < len(s) && !unicode.IsSpace(before) && !unicode.IsSpace(after) {
			b.WriteByte(' ')
		}
		last = l[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

func addReasoning(rs *[]string, r string) {
	if r = strings.TrimSpace(r); r != "" {
		*rs = append(*rs, r)
	}
}

// Labels an LLM puts before a prompt. Only a label at the very start is
// removed, and only with a colon or alone on a heading or bold line.
const (
	emph       = `[*_]{1,3}`
	labelWords = `(?:` +
		`(?:[\p{L}\d][\p{L}\d'-]*[ \t]+){0,4}prompts?` + // "Prompt", "Enhanced prompt", "Your refined SDXL prompt"
		`|positive|negative|output|result|response|answer|final answer` +
		`|(?:(?:sure|okay|ok|certainly|absolutely|of course)[!,.]?[ \t]+)?here(?:'s|’s| is| are)\b[^\n:]{0,80}` +
		`)`
)

var (
	labelColonRe = regexp.MustCompile(`(?i)^(?:#{1,6}[ \t]*)?(` + emph + `)?[ \t]*` + labelWords +
		`[ \t]*(` + emph + `)?[ \t]*:[ \t]*(` + emph + `)?`)
	labelLineRe = regexp.MustCompile(`(?i)^(?:#{1,6}[ \t]*(?:` + emph + `)?|` + emph + `)[ \t]*` + labelWords +
		`[ \t]*(?:` + emph + `)?[ \t]*:?[ \t]*(?:` + emph + `)?[ \t]*(?:\r?\n|$)`)
)

// stripLabel removes one leading label.
func stripLabel(s string) string {
	if loc := labelLineRe.FindStringIndex(s); loc != nil {
		return s[loc[1]:]
	}
	m := labelColonRe.FindStringSubmatchIndex(s)
	if m == nil {
		return s
	}
	rest := s[m[1]:]
	// "**Prompt: a castle**": the bold opened before the label closes at
	// the end of the text.
	if m[2] >= 0 && m[4] < 0 && m[6] < 0 {
		if open := s[m[2]:m[3]]; strings.HasSuffix(rest, open) && len(rest) >= len(open) {
			rest = rest[:len(rest)-len(open)]
		}
	}
	return rest
}

// quotePairs are the wrappers stripQuotes removes, outermost first.
func quotePairs() [10]struct{ open, close string } {
	return [...]struct{ open, close string }{
		{"```", "```"},
		{"**", "**"},
		{"__", "__"},
		{`"`, `"`},
		{"“", "”"},
		{"„", "“"},
		{"«", "»"},
		{"‘", "’"},
		{"'", "'"},
		{"`", "`"},
	}
}

// stripQuotes removes one pair of wrappers around the whole text, when the
// text inside does not use the same quote in a way that would make the
// result unbalanced ("a" and "b" keeps its quotes).
func stripQuotes(s string) string {
	for _, q := range quotePairs() {
		if len(s) < len(q.open)+len(q.close) || !strings.HasPrefix(s, q.open) || !strings.HasSuffix(s, q.close) {
			continue
		}
		inner := s[len(q.open) : len(s)-len(q.close)]
		if q.open == "```" {
			return fenceBody(inner)
		}
		if balanced(inner, q.open, q.close) {
			return inner
		}
	}
	return s
}

// fenceBody drops a code fence's info string ("```text").
func fenceBody(inner string) string {
	nl := strings.IndexByte(inner, '\n')
	if nl < 0 {
		return inner
	}
	if info := strings.TrimSpace(inner[:nl]); info == "" || !strings.ContainsAny(info, " \t") {
		return inner[nl+1:]
	}
	return inner
}

// balanced reports whether inner can lose the quotes around it: for a
// quote that opens and closes alike, inner must not contain it (apostrophes
// between letters aside); for a pair, every closing quote in inner must
// close an opening one.
func balanced(inner, open, close string) bool {
	if open == close {
		for i := 0; ; {
			j := strings.Index(inner[i:], open)
			if j < 0 {
				return true
			}
			j += i
			if !isApostrophe(inner, j, open) {
				return false
			}
			i = j + len(open)
		}
	}
	depth := 0
	for i := 0; i < len(inner); {
		switch {
		case strings.HasPrefix(inner[i:], open):
			depth++
			i += len(open)
		case strings.HasPrefix(inner[i:], close):
			if !isApostrophe(inner, i, close) {
				if depth == 0 {
					return false
				}
				depth--
			}
			i += len(close)
		default:
			i++
		}
	}
	return depth == 0
}

// isApostrophe reports whether the quote q at inner[i:] sits between two
// letters, as in "knight's".
func isApostrophe(inner string, i int, q string) bool {
	if q != "'" && q != "’" {
		return false
	}
	before, _ := utf8.DecodeLastRuneInString(inner[:i])
	after, _ := utf8.DecodeRuneInString(inner[i+len(q):])
	return i > 0 && i+len(q) < len(inner) && unicode.IsLetter(before) && unicode.IsLetter(after)
}
