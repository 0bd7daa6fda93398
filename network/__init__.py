"""network: the broker's network edge (layer 3): the acceptor, processor and handler actors,
security, and the client side of a connection.
"""
