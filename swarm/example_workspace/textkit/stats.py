def words(text):
    return text.split()


def word_count(text):
    """Number of words in text."""
    return len(words(text))


def average_word_length(text):
    found = words(text)
    return sum(len(word) for word in found) / len(found)


def longest_word(text):
    found = words(text)
    return max(found, key=len) if found else ""
