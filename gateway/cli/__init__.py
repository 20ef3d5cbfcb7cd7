"""The `botgw` command (`botgw = gateway.cli:main`): main.py assembles the parser from one module per command
group, each with its own `register`; common.py holds what they share."""

from gateway.cli.main import build_parser, main, outcome

__all__ = ["build_parser", "main", "outcome"]
