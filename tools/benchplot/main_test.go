package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAndRender(t *testing.T) {
	in := "# system\tnodes\tops/s\nbrain\t3\t4000\netcd\t1\t2500\nbrain\t1\t2000\netcd\t3\t2300\n"
	series, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := series["brain"]; len(got) != 2 || got[0].nodes != 1 || got[1].ops != 4000 {
		t.Fatalf("brain series = %+v", got)
	}
	out := filepath.Join(t.TempDir(), "s.png")
	if err := render(series, "t", "ops/s", out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if img.Bounds().Dx() < 100 {
		t.Fatalf("image too small: %v", img.Bounds())
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{"", "brain\t1\n", "brain\tx\t1\n", "brain\t1\t-3\n", "brain\t0\t1\n"} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q) accepted bad input", in)
		}
	}
}
