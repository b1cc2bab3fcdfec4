// Package handoff holds the three-process kill test of issue 45's
// exclusive hand-off: an orchestrator whose phases reserve the room they
// hand over, a second vramguard program with a budget, and the real
// vramgate binary, all on one simulated device, SIGKILLed at random
// points. Its tests run in make's test-unit and test-nocgo stages.
package handoff
