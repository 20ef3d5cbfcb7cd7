"""The simulated 微信客服 (Kefu): its API (api.py), the control routes that play the customer, the human agents and
the platform's events (control.py), the documented rules and errcodes (rules.py), what it remembers (state.py) and
keeps across restarts (snapshot.py, written by simulator/state_file.py), and the signed callback that tells a bot to
pull (signer.py). Reference: /work/shared/reference/wecom-kf.md, cited as [ref §n]."""
