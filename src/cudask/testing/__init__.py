"""cudask.testing"""
