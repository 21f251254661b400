//go:build race

package prefix

const raceEnabled = true
