module github.com/cxltier/cxltier

go 1.26.0

toolchain go1.26.8

require (
	github.com/klauspost/compress v1.20.3
	github.com/valyala/fasthttp v1.77.0
	golang.org/x/sys v0.49.0
	gonum.org/v1/plot v0.17.0
	gorgonia.org/cu v0.9.6
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/uuid v1.1.1 // indirect
	github.com/molecule-man/go-brrr v1.3.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
