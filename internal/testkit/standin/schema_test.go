package standin

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
)

func TestSchemaPieces(t *testing.T) {
	word := `"[a-z]+"`
	for _, tc := range []struct {
		name, schema string
		want         string // a regular expression for the joined pieces; "" means unsupported
	}{
		{"strings, required in properties order",
			`{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["negative","positive"]}`,
			`\{"positive":` + word + `,"negative":` + word + `\}`},
		{"optional properties left out",
			`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"required":["b"]}`,
			`\{"b":` + word + `\}`},
		{"no required", `{"type":"object","properties":{"a":{"type":"string"}}}`, `\{\}`},
		{"empty schema", `{}`, `\{\}`},
		{"properties without type", `{"properties":{"x":{"type":"string"}},"required":["x"]}`, `\{"x":` + word + `\}`},
		{"other types",
			`{"type":"object","properties":{"n":{"type":"integer"},"f":{"type":"number"},"b":{"type":"boolean"},"z":{"type":"null"},"l":{"type":"array","items":{"type":"string"}},"o":{"type":"object","properties":{"s":{"type":"string","description":"d"}},"required":["s"]}},"required":["n","f","b","z","l","o"],"additionalProperties":false}`,
			`\{"n":0,"f":0,"b":false,"z":null,"l":\[\],"o":\{"s":` + word + `\}\}`},
		{"enum and const", `{"type":"object","properties":{"e":{"enum":["x y",2]},"c":{"const":{"k": 1}}},"required":["e","c"]}`, `\{"e":"x y","c":\{"k":1\}\}`},
		{"type list", `{"type":["string","null"]}`, word},
		{"escaped key", `{"type":"object","properties":{"a\"b":{"type":"string"}},"required":["a\"b"]}`, `\{"a\\"b":` + word + `\}`},
		{"anyOf", `{"anyOf":[{"type":"string"}]}`, ""},
		{"string constraint", `{"type":"string","minLength":3}`, ""},
		{"undeclared required", `{"type":"object","required":["x"]}`, ""},
		{"unknown type", `{"type":"date"}`, ""},
		{"not an object", `"json"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pieces, err := schemaPieces(json.RawMessage(tc.schema), newSampler(nil, 1))
			if tc.want == "" {
				if !errors.Is(err, errSchemaUnsupported) {
					t.Fatalf("pieces %q, error %v; want errSchemaUnsupported", pieces, err)
				}
				return
			}
			got := strings.Join(pieces, "")
			if err != nil || !regexp.MustCompile(`^`+tc.want+`$`).MatchString(got) {
				t.Fatalf("got %q (%d pieces), error %v; want %s", got, len(pieces), err, tc.want)
			}
			if !json.Valid([]byte(got)) {
				t.Fatalf("%q is not valid JSON", got)
			}
			again, _ := schemaPieces(json.RawMessage(tc.schema), newSampler(nil, 1))
			if strings.Join(again, "") != got {
				t.Fatalf("not deterministic: %q then %q", got, strings.Join(again, ""))
			}
		})
	}
}

func FuzzSchemaPieces(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`,
		`{"properties":{"o":{"properties":{"o":{}},"required":["o"]}},"required":["o"]}`,
		`{"enum":[]}`, `{"const":null}`, `[]`, `{"type":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pieces, err := schemaPieces(b, newSampler(nil, 0))
		if err != nil {
			return
		}
		if got := strings.Join(pieces, ""); !json.Valid([]byte(got)) {
			t.Fatalf("schema %q gave invalid JSON %q", b, got)
		}
	})
}

func TestChatSchema(t *testing.T) {
	schema := `{"type":"object"}`
	for _, tc := range []struct {
		name, body string
		want       string // "" for none
		status     int
	}{
		{"none", `{}`, "", 0},
		{"ollama json_schema", `{"response_format":{"type":"json_schema","json_schema":{"name":"schema","schema":` + schema + `}}}`, schema, 0},
		{"ollama json", `{"response_format":{"type":"json_object"}}`, `{}`, 0},
		{"json_object with schema", `{"response_format":{"type":"json_object","schema":` + schema + `}}`, schema, 0},
		{"text", `{"response_format":{"type":"text"},"json_schema":` + schema + `}`, schema, 0},
		{"top-level json_schema", `{"json_schema":` + schema + `}`, schema, 0},
		{"response_format wins", `{"json_schema":{"type":"string"},"response_format":{"type":"json_object"}}`, `{}`, 0},
		{"bad type", `{"response_format":{"type":"xml"}}`, "", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body chatRequest
			if err := json.Unmarshal([]byte(tc.body), &body); err != nil {
				t.Fatal(err)
			}
			got, e := chatSchema(body)
			if tc.status != 0 {
				if e == nil || e.Code != tc.status {
					t.Fatalf("got %s, %+v; want HTTP %d", got, e, tc.status)
				}
				return
			}
			if e != nil || string(got) != tc.want {
				t.Fatalf("got %s, %+v; want %s", got, e, tc.want)
			}
		})
	}
}
