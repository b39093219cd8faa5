"""cudask.cli"""
