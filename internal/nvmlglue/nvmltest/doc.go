// Package nvmltest builds go-nvml mocks of whole machines for tests of code
// that reads GPUs through nvml.Interface. Like go-nvml's mock package it
// needs cgo on Linux; in other builds it is empty.
package nvmltest
