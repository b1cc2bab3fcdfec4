# Sourced by the mutation checks (oracle-mutants.sh, compose-mutants.sh).
# mutant_tree REPO PATCH: a new folder holding a copy of REPO's working tree
# (the files git does not ignore) with PATCH applied, printed on stdout; it
# fails, naming the patch, when the patch no longer applies (the code it
# breaks moved, and the mutant must follow it).
mutant_tree() {
	local repo=$1 patch=$2 tmp
	tmp=$(mktemp -d)
	(cd "$repo" && git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$tmp")
	if ! (cd "$tmp" && patch -p1 --quiet <"$patch"); then
		echo "$(basename "$patch" .patch): the patch no longer applies" >&2
		rm -rf "$tmp"
		return 1
	fi
	echo "$tmp"
}
