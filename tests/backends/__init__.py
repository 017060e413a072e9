"""Tests of the backends."""
