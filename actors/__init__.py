"""actors: the runtime (layer 2): actor processes, their mailboxes and supervision, and the
names they use for each other.
"""
