package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "prefix cache on %s, %d cores, engine %s\n\n", rep.CPU, rep.Cores, rep.Engine)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tshards\tbatch\tprocs\tkeys/s (median)\tmin\tmax\tper process\tscaling\t")
	for _, r := range rep.Ops {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.3g\t%.3g\t%.3g\t%.3g\t%.2f×\t\n", r.Op, r.Shards, r.Batch, r.Procs,
			r.KeysPerSec, r.MinKeys, r.MaxKeys, r.PerProcess, r.Scaling)
	}
	tw.Flush()
	if len(rep.Moves) > 0 {
		m := rep.Moves[0]
		fmt.Fprintf(w, "\nblock moves: %d × %d KiB per batch, %d rounds, against a copy of the same bytes (%.2f ms median; %.2f ms split over every core)\n",
			m.Blocks, m.BlockBytes>>10, m.Rounds, m.CopyMs, m.CoresCopyMs)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "op\tdst past a page\tmin ms\tmedian ms\tmax ms\tGB/s\tvs copy\tvs copy on every core\tverified / unverified\t")
		for _, m := range rep.Moves {
			ratio := "-"
			if m.VerifiedOverUnverified > 0 {
				ratio = fmt.Sprintf("%.2f×", m.VerifiedOverUnverified)
			}
			fmt.Fprintf(tw, "%s\t+%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f×\t%.2f×\t%s\t\n", m.Op, m.DstOffset, m.MinMs, m.MedianMs,
				m.MaxMs, m.GBps, m.VsCopy, m.VsCoresCopy, ratio)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nblock round trips (redis: %s)\n", rep.Redis)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\ttokens\tblock\tput p50 µs\tput p99 µs\tget p50 µs\tget p99 µs\tround trip µs\tGB/s\tvs redis\t")
	for _, r := range rep.RoundTrip {
		vs := "-"
		if r.VsRedis > 0 {
			vs = fmt.Sprintf("%.2f×", r.VsRedis)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d KiB\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t\n", r.Path, r.Tokens, r.BlockBytes>>10,
			r.PutP50us, r.PutP99us, r.GetP50us, r.GetP99us, r.RTP50us, r.GBps, vs)
	}
	tw.Flush()
}
