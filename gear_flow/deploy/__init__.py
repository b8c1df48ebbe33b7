"""Deployment helpers shared by ``cluster/*.sh`` and ``gear-flow local``: which address every
listener binds (:mod:`.net`), whether this node has a GPU and what UCX needs without one
(:mod:`.ucx`), and a preload that turns a process's HTTP server off (:mod:`.no_http`).

``python -m gear_flow.deploy`` prints the launch scripts' settings as shell assignments.
"""
