import unittest

from textkit.stats import average_word_length, word_count


class StatsTest(unittest.TestCase):
    def test_word_count(self):
        self.assertEqual(word_count("the quick brown fox"), 4)

    def test_average_word_length(self):
        self.assertEqual(average_word_length("ab abcd"), 3)


if __name__ == "__main__":
    unittest.main()
