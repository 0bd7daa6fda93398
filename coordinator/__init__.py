"""coordinator"""
