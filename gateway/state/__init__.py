"""What botgw keeps in Redis besides the queue: keys, reply records, memory, limits, conversations, tokens."""
