"""The black box: always on, the last seconds of every op, written when something goes wrong.

``opscope.blackbox(...)`` is :class:`opscope.black_box.box.blackbox`; see
that module for what it keeps, when it writes, and where.
"""
