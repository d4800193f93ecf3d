"""The jupytext front matter of a MyST notebook source, for tests that write tiny notebooks."""

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""
