"""cudask.devices"""
