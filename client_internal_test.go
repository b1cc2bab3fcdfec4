package vramguard

import (
	"errors"
	"net"
	"net/url"
	"syscall"
	"testing"
)

func TestClassifyTransportErrors(t *testing.T) {
	closedIdle := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/api/generate", Err: errors.New("http: server closed idle connection")}
	refused := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/api/generate",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, tt := range []struct {
		err  error
		want Kind
	}{
		{closedIdle, KindTransient},
		{refused, KindUnavailable},
		{errors.New("llama runner process has terminated: exit status 2"), KindModelCrash},
	} {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("classify(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
