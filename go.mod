module github.com/cxltier/cxltier

go 1.26.0

toolchain go1.26.8

require (
	github.com/klauspost/compress v1.20.3
	github.com/valyala/fasthttp v1.77.0
	golang.org/x/sys v0.49.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/google/uuid v1.1.1 // indirect
	github.com/molecule-man/go-brrr v1.3.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
)
