# Git on a fresh repository in /work: two commits on main, one on a branch,
# a merge; fixed identities and dates make every object id the same on any
# machine, so the ids printed are what git itself computed.
set -eu
export GIT_AUTHOR_NAME=Airlock GIT_AUTHOR_EMAIL=airlock@example.com
export GIT_COMMITTER_NAME=Airlock GIT_COMMITTER_EMAIL=airlock@example.com
export GIT_AUTHOR_DATE='2024-01-02T03:04:05Z' GIT_COMMITTER_DATE='2024-01-02T03:04:05Z'
git init -q -b main repo
cd repo
git config user.name Airlock
git config user.email airlock@example.com
printf 'one\ntwo\n' > a.txt
git add a.txt
git commit -q -m first
git checkout -q -b feature
echo three >> a.txt
git commit -q -am 'feature: three'
git checkout -q main
echo other > b.txt
git add b.txt
git commit -q -m second
git merge -q --no-edit feature
echo "commits=$(git log --oneline | wc -l)"
echo "branches=$(git branch --format='%(refname:short)' | tr '\n' ' ')"
git diff --stat HEAD~1 HEAD
git log --format='%h %s'
echo "head=$(git rev-parse HEAD)"
git fsck --strict 2>&1 && echo fsck ok
# Packing and cloning run pack-objects and index-pack, which use threads.
git repack -q -a -d -f --threads=2
echo "packed=$(git count-objects -v | grep '^in-pack:')"
cd ..
git clone -q --no-local repo copy
echo "cloned=$(git -C copy rev-parse HEAD)"
