// Package holdcheck holds the test that every method of the library's
// tier objects, and every export of the C ABI, passes the tier's gate
// (tier.Hold) before it touches tier memory: a rule checked in the source,
// so that a method added later cannot forget it. It has no code of its own.
package holdcheck
