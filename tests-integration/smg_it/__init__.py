"""Harness around the real SMG router (``smg`` from PyPI): start a worker, put the router in
front of it on loopback, wait for readiness, stop both by PID. Reusable by every engine package.
"""
