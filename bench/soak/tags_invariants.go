//go:build invariants

package main

// daemonTags builds the daemon the soak starts with the tags the soak was
// built with, so the invariants mode checks the daemon's mutations too.
const daemonTags = "invariants"
