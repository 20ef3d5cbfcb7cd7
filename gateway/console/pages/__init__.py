"""The console's pages, one module each; `PAGE_ROUTERS` is what gateway/console/routes.py installs."""

from __future__ import annotations

from gateway.console.pages import config, dead_letters, kf, knowledge, limits, overview, tools

PAGE_ROUTERS = [overview.router, dead_letters.router, knowledge.router, kf.router, limits.router, tools.router,
                config.router]
