"""The simulated WeCom: the app API (api.py), its control routes (control.py), what it remembers (state.py), the
signed callbacks it sends (signer.py), group robots and AI-bot response URLs (robots.py), and an AI bot's user
(ai_user.py)."""
