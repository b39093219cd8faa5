"""cudask.deploy"""
