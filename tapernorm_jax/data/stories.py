"""An offline corpus: short, simple-English stories generated procedurally, deterministic by seed.

Each story draws a hero (a child or an animal), a friend, a place and an object, and runs one
of several small plots (a lost thing found, a stuck thing rescued, a lesson about sharing,
a surprise, a storm, a new friend, ...) with dialogue in quotes. Story `i` of a split depends
only on (seed, split, i), so corpora of different sizes share their first stories, and the
train and validation splits never share a story stream. No download, no file.
"""

import random
from collections.abc import Iterator
from dataclasses import dataclass

GENERATOR_VERSION = 1  # bump when the text a seed produces changes, so cached corpora are rebuilt

GIRLS = ("Lily", "Mia", "Anna", "Sue", "Lucy", "Emma", "Zoe", "Sara", "Amy", "Ella", "Kim", "Rose", "Jane", "Lola")
BOYS = ("Tim", "Ben", "Sam", "Max", "Tom", "Jack", "Leo", "Bob", "Joe", "Dan", "Finn", "Noah", "Jake", "Ollie")
# Syllables for made-up names, which give the corpus an open vocabulary (a 2,000-piece tokenizer needs one).
ONSETS = (
  "B",
  "D",
  "F",
  "G",
  "J",
  "K",
  "L",
  "M",
  "N",
  "P",
  "R",
  "S",
  "T",
  "V",
  "W",
  "Z",
  "Br",
  "Ch",
  "Fl",
  "Gr",
  "Pl",
  "Sh",
  "St",
  "Tr",
  "Qu",
  "H",
  "Y",
  "C",
  "Bl",
  "Dr",
)
VOWELS = ("a", "e", "i", "o", "u", "ee", "oo", "ai", "ay", "ia", "ou", "y")
CODAS = ("", "", "", "n", "m", "l", "r", "x", "s", "t", "k", "nd", "ck", "sh", "th", "ll", "ss")
ANIMALS = (
  "cat",
  "dog",
  "bunny",
  "bird",
  "frog",
  "duck",
  "bear",
  "fox",
  "mouse",
  "puppy",
  "kitten",
  "owl",
  "turtle",
  "squirrel",
  "pig",
  "lamb",
)
TRAITS = (
  "kind",
  "curious",
  "brave",
  "shy",
  "happy",
  "silly",
  "clever",
  "gentle",
  "busy",
  "little",
  "friendly",
  "funny",
  "careful",
  "cheerful",
)
PLACES = (  # (name, preposition, things there)
  ("the park", "at", ("a big slide", "a green bench", "a tall tree", "a small pond")),
  ("the forest", "in", ("a tall tree", "a quiet path", "a hollow log", "some soft moss")),
  ("the garden", "in", ("red flowers", "a little fence", "a tall tree", "a pile of leaves")),
  ("the beach", "at", ("warm sand", "big waves", "a sand castle", "a pile of shells")),
  ("the farm", "on", ("a red barn", "a muddy pond", "a tall haystack", "a wooden fence")),
  ("the river", "by", ("a wooden bridge", "smooth rocks", "tall grass", "a little boat")),
  ("the town", "in", ("a toy shop", "a bakery", "a busy street", "a small fountain")),
  ("the hill", "on", ("soft grass", "a big rock", "a windy top", "a tall tree")),
  ("the school", "at", ("a sandbox", "a swing", "a big window", "a colorful rug")),
  ("the house", "in", ("a cozy bed", "a big sofa", "a dark closet", "a warm kitchen")),
)
OBJECTS = (  # (noun, adjectives that fit it)
  ("ball", ("red", "bouncy", "big", "blue", "soft")),
  ("kite", ("red", "yellow", "long", "pretty", "bright")),
  ("hat", ("blue", "funny", "big", "soft", "green")),
  ("toy car", ("fast", "shiny", "small", "red", "blue")),
  ("teddy bear", ("soft", "brown", "old", "fluffy", "little")),
  ("book", ("big", "old", "colorful", "funny", "new")),
  ("balloon", ("red", "yellow", "big", "round", "shiny")),
  ("stone", ("shiny", "smooth", "round", "pretty", "small")),
  ("box", ("big", "old", "wooden", "small", "heavy")),
  ("doll", ("pretty", "small", "soft", "old", "little")),
  ("shell", ("pink", "shiny", "smooth", "pretty", "tiny")),
  ("drum", ("loud", "small", "red", "new", "shiny")),
  ("cake", ("sweet", "big", "yummy", "pink", "warm")),
  ("flower", ("yellow", "pretty", "tiny", "red", "purple")),
  ("boat", ("little", "blue", "wooden", "fast", "white")),
  ("crayon", ("purple", "green", "small", "bright", "new")),
)
Place = tuple[str, str, tuple[str, ...]]
Thing = tuple[str, str]  # (noun, adjective)
FOODS = ("an apple", "a cookie", "some bread", "a carrot", "some berries", "a sandwich", "some cheese", "a banana")
WEATHER = ("the sun was warm", "the sky was blue", "the wind was soft", "the air smelled sweet", "it was a bright day")
HAPPY = ("happy", "glad", "excited", "proud", "joyful")
SAD = ("sad", "upset", "worried", "scared", "lonely")
SAID = ("said", "asked", "shouted", "whispered", "cried", "replied")
MORALS = (
  "sharing makes everyone happy",
  "friends help each other",
  "it is good to be kind",
  "being brave is not so hard with a friend",
  "it is important to listen",
  "saying sorry can fix a lot",
  "you should always tell the truth",
  "working together makes hard things easy",
  "a little patience goes a long way",
  "it is nice to try new things",
)


@dataclass(frozen=True)
class Character:
  """A story character: a name (or "the dog") and the pronouns that go with it."""

  name: str
  intro: str  # how the story first presents them
  he: str
  him: str
  his: str


def article(word: str) -> str:
  """`a` or `an` before `word`."""
  return "an" if word[0] in "aeiou" else "a"


def cap(text: str) -> str:
  """`text` with its first letter upper-cased."""
  return text[:1].upper() + text[1:]


def made_up_name(rng: random.Random) -> str:
  """A pronounceable made-up name of two or three syllables, such as `Bramo` or `Telika`."""
  syllables = [rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(rng.choice((2, 2, 3)))]
  return cap("".join(syllables).lower() + rng.choice(CODAS))


def character(rng: random.Random, avoid: str = "") -> Character:
  """A random child or named animal, whose name differs from `avoid`."""
  while True:
    kind = rng.random()
    girl = kind < 0.4 or (kind >= 0.8 and rng.random() < 0.5)
    name = made_up_name(rng) if rng.random() < 0.3 else rng.choice(GIRLS if girl else BOYS)
    if name != avoid:
      break
  pron = ("she", "her", "her") if girl else ("he", "him", "his")
  trait = rng.choice(TRAITS)
  if kind < 0.8:
    who = "girl" if girl else "boy"
    return Character(name, f"{article(trait)} {trait} {who} named {name}", *pron)
  animal = rng.choice(ANIMALS)
  return Character(name, f"{article(trait)} {trait} {animal} named {name}", *pron)


def thing(rng: random.Random) -> Thing:
  """An object as (noun, adjective)."""
  noun, adjectives = rng.choice(OBJECTS)
  return noun, rng.choice(adjectives)


def opening(rng: random.Random, hero: Character) -> str:
  """The first sentence, which introduces the hero."""
  return rng.choice(
    (
      f"Once upon a time, there was {hero.intro}.",
      f"Once upon a time there was {hero.intro}.",
      f"There once was {hero.intro}.",
      f"In a little house, there lived {hero.intro}.",
      f"Long ago, in a small town, there lived {hero.intro}.",
    )
  )


def plot_lost(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero loses a treasured object and a friend helps to find it."""
  noun, adj = obj
  name, prep, spots = place
  spot = rng.choice(spots)
  return [
    f"{hero.name} had {article(adj)} {adj} {noun}. {cap(hero.he)} loved it very much and took it everywhere.",
    f"One day, {hero.name} went to {name} to play. When it was time to go home, the {noun} was gone! "
    f"{hero.name} felt {rng.choice(SAD)}.",
    f"\"Where is my {noun}?\" {hero.name} {rng.choice(('cried', 'asked', 'said'))}. "
    f"{friend.name} saw {hero.him} and came over. \"Don't worry, I will help you look,\" {friend.name} said.",
    f"They looked everywhere {prep} {name}. At last, {friend.name} looked near {spot}. "
    f"\"I found it!\" {friend.he} shouted.",
    f"{hero.name} hugged {friend.name}. \"Thank you!\" {hero.he} said. "
    f"From that day on, {hero.name} and {friend.name} were best friends.",
  ]


def plot_stuck(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero's object gets stuck up high and the two solve it together."""
  noun, adj = obj
  name, prep, _ = place
  helper = rng.choice(("a long stick", "a tall ladder", "a big jump", "a strong rope"))
  return [
    f"{hero.name} liked to play with {hero.his} {adj} {noun} {prep} {name}. "
    f"One day, {rng.choice(WEATHER)}, and {hero.he} threw the {noun} up high.",
    f"Oh no! The {noun} got stuck in a tall tree. {hero.name} tried to reach it, but {hero.he} was too small.",
    f"\"Can you help me?\" {hero.name} asked {friend.name}. \"Yes! Let's try {helper},\" {friend.name} said.",
    f"They worked together, and soon the {noun} fell down into the grass. {hero.name} laughed and clapped.",
    f"\"We did it!\" they said. {hero.name} learned that {rng.choice(MORALS[5:8] + MORALS[1:2])}.",
  ]


def plot_share(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero does not want to share, then learns to."""
  noun, adj = obj
  name, prep, _ = place
  return [
    f"{hero.name} had a new {noun}. It was {adj} and {hero.he} did not want anyone else to touch it.",
    f"{prep.capitalize()} {name}, {friend.name} saw the {noun}. \"Can I play with it too?\" {friend.he} asked.",
    f"\"No, it is mine!\" {hero.name} said. {friend.name} looked {rng.choice(SAD)} and walked away.",
    f"Soon {hero.name} was bored. Playing alone was not fun. {cap(hero.he)} went to find {friend.name}.",
    f"\"I am sorry,\" {hero.name} said. \"Do you want to play with my {noun}?\" {friend.name} smiled. \"Yes, please!\"",
    f"They played together all day. {hero.name} learned that {rng.choice(MORALS[:3])}.",
  ]


def plot_surprise(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero prepares a surprise for a friend."""
  noun, adj = obj
  food = rng.choice(FOODS)
  return [
    f"It was {friend.name}'s birthday. {hero.name} wanted to give {friend.him} something special.",
    f"{cap(hero.he)} thought and thought. Then {hero.he} had an idea. {cap(hero.he)} would make "
    f"{article(adj)} {adj} {noun}!",
    f"{hero.name} worked very hard. {cap(hero.he)} also packed {food} in a little bag.",
    f"When {friend.name} saw the {noun}, {friend.his} eyes got big. \"Wow! Is this for me?\" {friend.he} asked.",
    f"\"Yes! Happy birthday!\" {hero.name} said. {friend.name} was so {rng.choice(HAPPY)}. "
    f"They shared {food} and laughed together.",
  ]


def plot_storm(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """A storm scares the hero and a friend keeps them company."""
  name, prep, spots = place
  return [
    f"{hero.name} and {friend.name} were playing {prep} {name}. Suddenly, the sky got dark.",
    f"Big drops of rain began to fall, and there was a loud boom. {hero.name} felt {rng.choice(SAD[3:] + SAD[:2])}.",
    f"\"I don't like storms,\" {hero.name} {rng.choice(('whispered', 'said'))}. "
    f"\"Let's hide under {rng.choice(spots)},\" said {friend.name}. \"I will stay with you.\"",
    "They sat close together and sang a silly song until the rain stopped.",
    f"Soon the sun came out and they saw a big rainbow. \"That was not so bad,\" {hero.name} said with a smile. "
    f"{cap(hero.he)} learned that {MORALS[3]}.",
  ]


def plot_new_friend(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The shy hero meets someone new."""
  noun, adj = obj
  name, prep, spots = place
  return [
    f"{hero.name} went to {name} with {hero.his} mom. {cap(hero.he)} saw {friend.intro} near {rng.choice(spots)}.",
    f"{hero.name} wanted to say hello, but {hero.he} felt shy. {hero.his.capitalize()} mom said, "
    f"\"Why don't you show {friend.him} your {noun}?\"",
    f"{hero.name} walked over slowly. \"Hi, I am {hero.name}. Do you like my {adj} {noun}?\" {hero.he} asked.",
    f"\"I love it!\" {friend.name} said. \"Can we play together?\"",
    f"They played until the sun went down. {hero.name} was {rng.choice(HAPPY)} that {hero.he} was brave. "
    f"{cap(hero.he)} learned that {rng.choice(MORALS[3:4] + MORALS[9:])}.",
  ]


def plot_listen(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero ignores a warning, gets into trouble, and says sorry."""
  noun, adj = obj
  name, prep, _ = place
  return [
    f"{hero.name}'s mom said, \"Please do not play with your {noun} near the mud.\" But {hero.name} did not listen.",
    f"{cap(hero.he)} ran {prep} {name} and threw the {adj} {noun} high. It fell right into the mud. Splash!",
    f"Now the {noun} was dirty, and so was {hero.name}. {cap(hero.he)} felt {rng.choice(SAD)}.",
    f"{cap(hero.he)} went home and said, \"I am sorry, Mom. I should have listened.\" "
    f"Mom gave {hero.him} a hug. \"Let's clean it together,\" she said.",
    f"They washed the {noun} until it was {adj} again. {hero.name} learned that {rng.choice(MORALS[4:6])}.",
  ]


def plot_help_animal(rng: random.Random, hero: Character, friend: Character, place: Place, obj: Thing) -> list[str]:
  """The hero finds a hungry little animal and helps it."""
  name, prep, spots = place
  animal = rng.choice(ANIMALS)
  food = rng.choice(FOODS)
  return [
    f"One morning, {hero.name} was walking {prep} {name}. {cap(rng.choice(WEATHER))}.",
    f"Near {rng.choice(spots)}, {hero.he} heard a small sound. It was a tiny {animal}, and it looked hungry.",
    f"\"Poor little {animal},\" {hero.name} said. \"Are you lost?\" The {animal} looked up at {hero.him}.",
    f"{hero.name} gave it {food}. The {animal} ate it all and jumped with joy.",
    f"Then {friend.name} came by. \"You are so kind,\" {friend.he} {rng.choice(SAID[:2])}. "
    f"Together they took the {animal} back to its mother. {hero.name} felt {rng.choice(HAPPY)} all day.",
  ]


PLOTS = (plot_lost, plot_stuck, plot_share, plot_surprise, plot_storm, plot_new_friend, plot_listen, plot_help_animal)


def story(rng: random.Random) -> str:
  """One story: an opening, a plot of dialogue and events, and an ending, in short paragraphs."""
  hero = character(rng)
  friend = character(rng, avoid=hero.name)
  place = rng.choice(PLACES)
  obj = thing(rng)
  lines = rng.choice(PLOTS)(rng, hero, friend, place, obj)
  lines[0] = f"{opening(rng, hero)} {lines[0]}"
  if rng.random() < 0.5:
    lines.append(
      rng.choice(
        (
          "The end.",
          f"{hero.name} went to bed with a big smile.",
          "And they all lived happily ever after.",
          f"It was the best day ever for {hero.name}.",
          f"{hero.name} never forgot that day.",
        )
      )
    )
  # Two or three short paragraphs, as in TinyStories.
  cut = sorted(rng.sample(range(1, len(lines)), k=min(2, len(lines) - 1)))
  paragraphs = [lines[: cut[0]], lines[cut[0] : cut[-1]], lines[cut[-1] :]]
  return "\n".join(" ".join(p) for p in paragraphs if p)


SPLIT_IDS = {"train": 0, "validation": 1}


def story_rng(seed: int, split: str, index: int) -> random.Random:
  """The random stream of story `index` of `split`: independent of every other story."""
  return random.Random(f"tapernorm-stories/v{GENERATOR_VERSION}/{seed}/{SPLIT_IDS[split]}/{index}")


def generate(num_stories: int, seed: int = 0, split: str = "train") -> Iterator[str]:
  """`num_stories` stories of `split`, deterministic by `seed`."""
  if split not in SPLIT_IDS:
    raise ValueError(f"split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
  for index in range(num_stories):
    yield story(story_rng(seed, split, index))
