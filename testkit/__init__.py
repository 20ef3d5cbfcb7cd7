"""The test kit that tests/ and bench/ share: child processes and their environment (processes.py), botgw's own
processes started for a test (services.py), probes of running ones (probes.py), configurations (configs.py), Redis
servers and topologies (redis_servers.py), fakes (a stub engine, a holding proxy) and Chromium (browser.py).

Never imported by product code (gateway/, bots/, engine/, knowledge/, webchat/) and not in the Docker image."""
