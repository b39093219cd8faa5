"""cudask.bench"""
