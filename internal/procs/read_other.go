//go:build !linux

package procs

import (
	"errors"
	"io"
	"os"
)

// readInto reads at most len(buf) bytes of the file at path into buf.
// Only Linux has procfs; this serves fake trees in tests elsewhere.
func readInto(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}
