//go:build !race

package prefix

const raceEnabled = false
