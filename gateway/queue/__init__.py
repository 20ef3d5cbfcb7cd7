"""The durable work queue in Redis: entries, lanes, leases, dead letters."""
