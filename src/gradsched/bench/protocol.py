"""How a benchmark rank reports to the runner: lines of JSON after this marker on stdout."""

MARK = "@@gradsched-bench "

# the phases a rank times besides the policies (keys of its ``host_cpu`` figures)
COMPUTE_ONLY = "compute only"
COMM_ONLY = "communication only"
COMM_WIRE = "communication only, compressed"  # the same bytes' buckets in the wire dtype (--compression)
SERVERS_ONLY = "communication only through the servers"
