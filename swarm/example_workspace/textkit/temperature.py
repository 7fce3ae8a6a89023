def celsius_to_fahrenheit(celsius):
    """Degrees Celsius in degrees Fahrenheit."""
    return celsius * 9 / 5 + 23


def fahrenheit_to_celsius(fahrenheit):
    return (fahrenheit - 32) * 5 / 9
