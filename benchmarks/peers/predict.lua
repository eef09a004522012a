-- wrk script of the head-to-head: POST one row of the model's features to /predict, and print the step's
-- figures as one line of JSON when wrk is done (latencies in microseconds, from wrk's own histogram).
wrk.method = "POST"
wrk.body = os.getenv("PEERS_BODY") or "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      '{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, ' ..
      '"timeout": %d, "p50_us": %d, "p95_us": %d, "p99_us": %d, "mean_us": %.1f, "max_us": %d}\n',
      summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50.0), latency:percentile(95.0), latency:percentile(99.0), latency.mean, latency.max))
end
