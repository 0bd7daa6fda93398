"""Odradek, a Kafka-class streaming log broker: the public face.

``odradek serve`` runs a broker; the client classes (Producer, Consumer, Admin) are exported
here as they land.
"""
__version__ = "0.1.0"
