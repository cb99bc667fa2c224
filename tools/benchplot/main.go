package main

import (
	"bufio"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func main() {
	in := flag.String("in", "", "tab-separated results: system, nodes, ops/s (default: standard input)")
	out := flag.String("out", "scaling.png", "PNG file to write")
	title := flag.String("title", "write throughput vs cluster size", "plot title")
	ylabel := flag.String("ylabel", "ops/s", "y axis label")
	flag.Parse()
	r := io.Reader(os.Stdin)
	if *in != "" {
		f, err := os.Open(*in)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		r = f
	}
	series, err := parse(r)
	if err != nil {
		fatal(err)
	}
	if err := render(series, *title, *ylabel, *out); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s\n", *out)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchplot:", err)
	os.Exit(1)
}

// point is one measurement.
type point struct {
	nodes int
	ops   float64
}

// parse reads "system nodes ops" lines into series by system, in order of
// first appearance, each sorted by nodes.
func parse(r io.Reader) (map[string][]point, error) {
	series := make(map[string][]point)
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Split(text, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want 3 tab-separated fields, got %d", line, len(f))
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("line %d: bad node count %q", line, f[1])
		}
		v, err := strconv.ParseFloat(f[2], 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("line %d: bad throughput %q", line, f[2])
		}
		series[f[0]] = append(series[f[0]], point{n, v})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(series) == 0 {
		return nil, fmt.Errorf("no results")
	}
	for _, pts := range series {
		sort.Slice(pts, func(i, j int) bool { return pts[i].nodes < pts[j].nodes })
	}
	return series, nil
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

func render(series map[string][]point, title, ylabel, out string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "nodes"
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(series))
	for name := range series {
		names = append(names, name)
	}
	sort.Strings(names)
	var ticks []plot.Tick
	seen := map[int]bool{}
	top := 0.0
	for i, name := range names {
		xys := make(plotter.XYs, len(series[name]))
		for j, pt := range series[name] {
			xys[j].X, xys[j].Y = float64(pt.nodes), pt.ops
			top = max(top, pt.ops)
			if !seen[pt.nodes] {
				seen[pt.nodes] = true
				ticks = append(ticks, plot.Tick{Value: float64(pt.nodes), Label: strconv.Itoa(pt.nodes)})
			}
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		c := palette[i%len(palette)]
		line.Color, line.Width = c, vg.Points(2)
		points.Color, points.Shape = c, draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(name, line, points)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Headroom above the highest point, under the legend.
	p.Y.Max = top * 1.35
	return p.Save(6*vg.Inch, 4*vg.Inch, out)
}
