"""cudask.worker"""
