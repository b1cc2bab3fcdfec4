package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/ollama/ollama/api"
)

// maxErrorBody bounds what is read of the body of an error status.
const maxErrorBody = 1 << 20

// NewRequest returns the POST of v, encoded as JSON, to url, as the api
// client sends it: Content-Type application/json, and accept as the Accept
// header ("application/x-ndjson" for a stream). ctx is the request's
// context, as in http.NewRequestWithContext.
func NewRequest(ctx context.Context, url string, v any, accept string) (*http.Request, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	return req, nil
}

// ReadStatusError is the error api.Client.Generate returns for resp, a
// status of 400 and up (FIELD_NOTES §1, trap 3): built from the first line
// of the body, with Status set. It reads at most 1 MiB of the body and
// does not close it.
func ReadStatusError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // what arrived is enough
	line := data
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		line = data[:i]
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	var e struct {
		Error     string `json:"error"`
		SigninURL string `json:"signin_url"`
	}
	if err := json.Unmarshal(line, &e); err != nil {
		return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: string(line)}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return api.AuthorizationError{StatusCode: resp.StatusCode, Status: resp.Status, SigninURL: e.SigninURL}
	}
	return api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: e.Error}
}
