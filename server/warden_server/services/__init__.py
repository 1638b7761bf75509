"""Thin gRPC servicers: decode, call the domain, encode, map errors."""
