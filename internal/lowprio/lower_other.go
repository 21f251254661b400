//go:build !linux

package lowprio

func lowerThisThread(p Policy) error {
	if p == Normal {
		return nil
	}
	return ErrUnsupported
}
