"""The simulated DingTalk: its OpenAPI sends and sessionWebhooks (api.py), AI cards (cards.py), the Stream gateway
(stream.py), the control routes (control.py), what it remembers (state.py), and a person writing to a robot
(user.py)."""
