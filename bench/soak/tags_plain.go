//go:build !invariants

package main

// daemonTags: see tags_invariants.go.
const daemonTags = ""
