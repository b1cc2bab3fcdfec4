package main

import (
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/readmecheck"
)

// TestPoolInREADME: the README's pool snippet is this program's middle
// part, as it is (one tab less).
func TestPoolInREADME(t *testing.T) { readmecheck.Part(t, "../../README.md", "main.go") }
