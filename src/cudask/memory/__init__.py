"""cudask.memory"""
