"""The chat corpus of bench/real_generation.py: real English, seeded, deterministic.

Half the lines open with one of three system prompts (~220–300 tokens each, an application's instructions
that its requests share) and ask a question that fits it; the other half have no system prompt (the template
adds its own short one) and are either a short question or a passage of 2–16 sentences (~60–400 tokens) with a
question about it. Most questions ask for an explanation, so most answers run to max_tokens.
"""

from __future__ import annotations

import random

from bench.generation import Line

SYSTEM_PROMPTS = (
    "You are the customer support assistant of Northwind Cycles, a family-run bicycle shop with two stores and "
    "an online catalogue. Answer questions about bicycles, parts, repairs, orders and deliveries. Be friendly, "
    "brief and precise, and write in plain English that a first-time rider understands. When a customer asks "
    "about a repair, explain what the mechanic will check, how long the work usually takes, and what it is "
    "likely to cost, but never promise a price before a mechanic has seen the bicycle. Our standard service "
    "takes two working days and includes cleaning the drivetrain, adjusting the gears and brakes, truing the "
    "wheels and checking every bolt for the right torque. Punctures are repaired while the customer waits. "
    "Orders placed before noon leave the warehouse on the same day; delivery takes two to four working days, "
    "and larger items such as complete bicycles are delivered by a courier who needs a signature. Customers may "
    "return unused items within thirty days for a full refund, and a bicycle within fourteen days if it has not "
    "been ridden outdoors. Warranty claims need the order number and a photograph of the fault. If a question "
    "is about safety, such as brakes that do not stop the bicycle or a cracked frame, tell the customer to stop "
    "riding at once and to bring the bicycle to a store. Do not discuss competitors, do not give medical or "
    "legal advice, and if you do not know an answer, say so and offer to pass the question to a member of staff.",
    "You are a cooking assistant for a community kitchen that teaches people to cook healthy meals on a small "
    "budget. The people you help are often cooking for a family for the first time, with a basic kitchen: a "
    "hob with four rings, an oven, a few pans, a sharp knife and a chopping board. Suggest recipes that use "
    "cheap, seasonal ingredients such as lentils, beans, rice, oats, eggs, onions, carrots, cabbage, potatoes "
    "and tinned tomatoes, and explain each step in order, with quantities for four people and the time each "
    "step takes. Always mention food safety where it matters: wash hands before cooking, keep raw meat apart "
    "from food that will not be cooked, cook chicken until the juices run clear, cool leftovers within two "
    "hours and eat them within two days. When someone names an allergy, leave that ingredient out entirely and "
    "suggest a safe replacement rather than a smaller amount. Prefer simple techniques over clever ones, and "
    "say how to tell when something is done by sight, smell or touch, because many of our cooks have no "
    "thermometer. Encourage people to taste as they go and to adjust salt at the end. Keep answers practical "
    "and warm in tone, and never make anyone feel bad about what they can afford or what they do not know.",
    "You are a patient science tutor for secondary school students aged eleven to sixteen. Your job is to help "
    "students understand ideas, not to do their homework for them. When a student asks a question, first "
    "explain the idea in one or two simple sentences, then give an everyday example, and then, if it helps, "
    "show the reasoning step by step. Use correct scientific words but explain each one the first time you "
    "use it. In physics, always state the units and check that the numbers make sense. In chemistry, say "
    "what happens to the particles, and balance any equation you write. In biology, link structure to "
    "function: say what a part is like and why that helps it do its job. If a student makes a mistake, point "
    "it out kindly and show how to correct it. If a question goes beyond the school syllabus, give a short "
    "answer and say that it is something they will meet later. Encourage curiosity, suggest a simple "
    "experiment that can be done safely at home when there is one, and never invent facts: if you are unsure, "
    "say so and suggest where the student could check.",
)
# Questions that fit each system prompt, in the same order.
SYSTEM_QUESTIONS = (
    (
        "My rear gears skip when I pedal hard. What could be wrong?",
        "How long does a full service take, and what is included?",
        "I ordered a helmet this morning. When will it arrive?",
        "Can I return a bicycle I bought last week if I only rode it in the car park?",
        "My front brake lever goes all the way to the handlebar. Is it safe to ride?",
        "What tyre pressure should I use for commuting on city roads?",
        "How do I make a warranty claim for a cracked saddle rail?",
        "Which is better for a beginner, rim brakes or disc brakes?",
    ),
    (
        "What can I cook for four people with lentils, carrots and an onion?",
        "How do I know when chicken thighs are cooked without a thermometer?",
        "My son is allergic to eggs. What can I use instead in pancakes?",
        "How long can I keep leftover rice, and how should I store it?",
        "Give me a simple vegetable soup recipe that costs very little.",
        "How do I cook dried beans so that they are soft?",
        "What is a healthy breakfast I can make with oats?",
        "How do I stop a tomato sauce from tasting sour?",
    ),
    (
        "Why does ice float on water?",
        "What is the difference between speed and velocity?",
        "How does a plant make its own food?",
        "Why do we balance chemical equations?",
        "What happens to the particles when salt dissolves in water?",
        "How do vaccines help the body fight disease?",
        "Why does a metal spoon feel colder than a wooden one at the same temperature?",
        "What is the job of the red blood cells?",
    ),
)
QUESTIONS = (
    "What is the capital of France?",
    "Explain how a rainbow forms.",
    "Write a short poem about the sea.",
    "What are three tips for sleeping better?",
    "Describe the water cycle in simple words.",
    "Why is the sky blue?",
    "How do I write a good cover letter?",
    "What causes the seasons on Earth?",
    "Give me some ideas for a rainy afternoon with children.",
    "Explain what a computer program is to a ten year old.",
    "What are the benefits of walking every day?",
    "How does a bicycle stay upright when it moves?",
    "Summarise the story of Romeo and Juliet.",
    "What should I pack for a weekend of hiking?",
    "How do bees make honey?",
    "Explain the difference between weather and climate.",
)
PASSAGE_SENTENCES = (
    "The town library opened in 1892 with a gift of two thousand books from a local mill owner.",
    "For most of its first century it occupied three rooms above the old corn exchange.",
    "In 1978 the council moved it to a new building beside the river, with a children's room and a reading garden.",
    "Floods in the winter of 2007 damaged the ground floor and destroyed part of the local history collection.",
    "Volunteers spent two years drying, cleaning and cataloguing the maps and letters that could be saved.",
    "Today the library lends about sixty thousand books a year, as well as laptops, seeds and board games.",
    "Its busiest day is Saturday, when a reading club for young children meets at ten in the morning.",
    "Adults can join a writing group, a chess club or a weekly class on using the internet safely.",
    "The building is heated by a ground source heat pump that was installed after the floods.",
    "Solar panels on the roof provide about a third of the electricity it uses over a year.",
    "A small cafe run by a local charity employs young people who are learning to work in kitchens.",
    "Last year the library started a home delivery service for readers who cannot leave their homes.",
    "The service is run by twelve volunteers who visit about eighty readers every fortnight.",
    "Funding remains a worry, because the council's budget for libraries has fallen for ten years in a row.",
    "A group of residents has started raising money to extend the opening hours on weekday evenings.",
    "The head librarian says the library is no longer just about books but about meeting other people.",
    "Many visitors come to use the free computers to apply for jobs or to contact government services.",
    "The reading garden is looked after by a gardening club that meets on the first Sunday of each month.",
)
PASSAGE_QUESTIONS = (
    "What are the main ways the library has changed since it opened?",
    "Why might the library need more money, and how are people helping?",
    "Explain how the library helps people who cannot visit it.",
    "Describe what a visitor could do at the library on a Saturday.",
)


def real_corpus(n: int, max_tokens: int, seed: int = 2026) -> tuple[list[Line], list[int]]:
    """n lines and the indices of those that open with a shared system prompt (half of them, interleaved)."""
    rng = random.Random(seed)
    shared = sorted(rng.sample(range(n), n // 2))
    opens_shared = set(shared)
    lines = []
    for i in range(n):
        if i in opens_shared:
            k = rng.randrange(len(SYSTEM_PROMPTS))
            messages = [
                {"role": "system", "content": SYSTEM_PROMPTS[k]},
                {"role": "user", "content": rng.choice(SYSTEM_QUESTIONS[k])},
            ]
        elif rng.random() < 0.5:
            messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
        else:
            passage = " ".join(rng.sample(PASSAGE_SENTENCES, rng.randint(2, 16)))
            question = rng.choice(PASSAGE_QUESTIONS)
            messages = [{"role": "user", "content": f"Read this passage, then answer.\n\n{passage}\n\n{question}"}]
        lines.append(Line(messages, max_tokens))
    return lines, shared
