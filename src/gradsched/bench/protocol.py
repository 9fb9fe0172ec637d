"""How a benchmark rank reports to the runner: lines of JSON after this marker on stdout."""

MARK = "@@gradsched-bench "
