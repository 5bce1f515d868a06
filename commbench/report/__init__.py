"""What a person reads: terminal tables, report.md/report.html, figures, progress, the benchmarks' views."""
