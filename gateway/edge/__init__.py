"""The HTTP edge (the gateway process): platform callbacks in, verified, deduplicated and queued in milliseconds."""
