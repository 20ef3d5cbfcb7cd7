"""The operator console: server-rendered pages at /console/ on the admin listener, for the people who run the bots
without a shell (README "Operator console"). auth.py: sessions and sign-in; web.py: what every page shares;
routes.py: sign-in and the audit of changes; pages/: one module per page; templates/ and static/: the HTML, the
stylesheet and the one script (no build step)."""
