"""Delivery: how an answer reaches the user, one module per reply style."""
