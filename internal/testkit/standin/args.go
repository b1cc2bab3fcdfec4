package standin

import (
	"strconv"
	"strings"
)

// options is what the stand-in takes from llama-server's command line.
type options struct {
	model        string
	alias        string
	host         string
	port         int
	ctxSize      int // -c; 0 means defaultCtxSize
	parallel     int // -np; 0 means 1
	contextShift bool
	listDevices  bool
	version      bool
	bad          []string // flags with a value the stand-in could not use
}

const (
	defaultHost    = "127.0.0.1"
	defaultPort    = 8080
	defaultCtxSize = 4096
)

// valueFlags are llama-server flags that always take the next argument as
// their value, even one that starts with "-" (such as "--keep -1").
var valueFlags = map[string]bool{
	"-m": true, "--model": true, "--port": true, "--host": true,
	"-c": true, "--ctx-size": true, "-np": true, "--parallel": true,
	"-a": true, "--alias": true, "--log-verbosity": true, "-lv": true,
	"--chat-template": true, "--chat-template-file": true, "--mmproj": true,
	"--lora": true, "--load-mode": true, "-ctk": true, "--cache-type-k": true,
	"-ctv": true, "--cache-type-v": true, "-fa": true, "--flash-attn": true,
	"-b": true, "--batch-size": true, "-ub": true, "--ubatch-size": true,
	"-ngl": true, "--gpu-layers": true, "--n-gpu-layers": true,
	"-t": true, "--threads": true, "-tb": true, "--threads-batch": true,
	"-sm": true, "--split-mode": true, "-mg": true, "--main-gpu": true,
	"--keep": true, "-n": true, "--n-predict": true, "--spec-type": true,
	"--spec-draft-n-max": true, "--spec-draft-model": true,
	"--image-min-tokens": true, "--image-max-tokens": true, "-s": true, "--seed": true,
	"-ts": true, "--tensor-split": true, "--api-key": true, "-to": true, "--timeout": true,
}

// boolFlags are llama-server flags that never take a value, so a following
// argument that does not look like a flag is not swallowed.
var boolFlags = map[string]bool{
	"--no-webui": true, "--offline": true, "--verbose": true, "-v": true,
	"--log-verbose": true, "--no-log-prefix": true, "--no-log-timestamps": true,
	"--log-prefix": true, "--log-timestamps": true, "--log-colors": true,
	"--context-shift": true, "--no-context-shift": true, "--jinja": true,
	"--no-jinja": true, "--embedding": true, "--embeddings": true,
	"--list-devices": true, "--version": true, "--no-mmproj-offload": true,
	"--mmproj-offload": true, "--spec-draft-backend-sampling": true,
	"--no-mmap": true, "--mmap": true, "--mlock": true, "--metrics": true,
	"--slots": true, "--no-slots": true, "-cb": true, "--cont-batching": true,
	"-nocb": true, "--no-cont-batching": true, "--no-warmup": true,
	"--reranking": true, "--rerank": true, "-h": true, "--help": true,
}

// parseArgs reads the flags the stand-in uses and skips all others. An
// unknown flag takes the next argument as its value when that argument
// does not look like a flag: it does not start with "--", nor with "-"
// and a letter (so "-1" is a value and "-c" a flag). "--flag=value" works
// for every flag.
func parseArgs(args []string) options {
	o := options{host: defaultHost, port: defaultPort}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !looksLikeFlag(arg) {
			continue // a stray value
		}
		name, value, hasValue := strings.Cut(arg, "=")
		if !strings.HasPrefix(name, "--") {
			// Short flags have no "=" form in llama.cpp; keep "-x=y" whole.
			name, value, hasValue = arg, "", false
		}
		switch {
		case hasValue:
		case boolFlags[name]:
		case valueFlags[name]:
			if i+1 < len(args) {
				i++
				value = args[i]
			}
		default:
			if i+1 < len(args) && !looksLikeFlag(args[i+1]) {
				i++
				value = args[i]
			}
		}
		o.apply(name, value)
	}
	return o
}

func looksLikeFlag(s string) bool {
	if strings.HasPrefix(s, "--") {
		return true
	}
	if len(s) >= 2 && s[0] == '-' {
		c := s[1]
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	return false
}

func (o *options) apply(name, value string) {
	number := func(min int) (int, bool) {
		n, err := strconv.Atoi(value)
		if err != nil || n < min {
			o.bad = append(o.bad, name+" "+value)
			return 0, false
		}
		return n, true
	}
	switch name {
	case "-m", "--model":
		o.model = value
	case "-a", "--alias":
		o.alias = value
	case "--host":
		if value != "" {
			o.host = value
		}
	case "--port":
		if n, ok := number(0); ok && n <= 65535 {
			o.port = n
		} else if ok {
			o.bad = append(o.bad, name+" "+value)
		}
	case "-c", "--ctx-size":
		if n, ok := number(0); ok {
			o.ctxSize = n
		}
	case "-np", "--parallel":
		if n, ok := number(-1); ok {
			o.parallel = n
		}
	case "--context-shift":
		o.contextShift = true
	case "--no-context-shift":
		o.contextShift = false
	case "--list-devices":
		o.listDevices = true
	case "--version":
		o.version = true
	}
}

// slotCtx is the context of one slot: llama-server divides -c among the
// -np slots, and Ollama passes -c num_ctx*parallel.
func (o options) slotCtx() int {
	n := o.ctxSize
	if n <= 0 {
		n = defaultCtxSize
	}
	if o.parallel > 1 {
		n /= o.parallel
	}
	return max(n, 1)
}

func (o options) slots() int { return max(o.parallel, 1) }
